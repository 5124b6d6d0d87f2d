/* Linked statically against the installed libibmsg.a with pkg-config --static (test/install/run):
 * it calls the library only where no RDMA device is needed, and exits 0 when the library it got
 * is the one its header describes. */
#include <ibmsg.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  int major = -1, minor = -1, patch = -1;
  char header[32];
  ibmsg_version(&major, &minor, &patch);
  snprintf(header, sizeof header, "%d.%d", IBMSG_VERSION_MAJOR, IBMSG_VERSION_MINOR);
  printf("libibmsg %s, %s: %s\n", ibmsg_version_string(), ibmsg_err_name(IBMSG_ETIMEDOUT),
         ibmsg_strerror(IBMSG_ETIMEDOUT));
  if (major != IBMSG_VERSION_MAJOR || minor != IBMSG_VERSION_MINOR ||
      strncmp(ibmsg_version_string(), header, strlen(header)) != 0) {
    fprintf(stderr, "the library is %d.%d.%d, the header %s\n", major, minor, patch, header);
    return 1;
  }
  return 0;
}
