/* A C program built with find_package(ibmsg): the versions of header and library agree. */
#include <ibmsg.h>
#include <stdio.h>

int main(void) {
  int major, minor, patch;
  ibmsg_version(&major, &minor, &patch);
  printf("C: libibmsg %s (header %d.%d)\n", ibmsg_version_string(), IBMSG_VERSION_MAJOR,
         IBMSG_VERSION_MINOR);
  return major == IBMSG_VERSION_MAJOR && minor == IBMSG_VERSION_MINOR ? 0 : 1;
}
