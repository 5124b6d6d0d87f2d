// A C++ program built with find_package(ibmsg): ibmsg.hpp compiles (C++17 from the target), and
// its error and version calls reach the library.
#include <ibmsg.hpp>
#include <iostream>
#include <string>

int main() {
  auto [major, minor, patch] = ibmsg::version();
  ibmsg::error e(IBMSG_ETIMEDOUT);
  std::cout << "C++: libibmsg " << ibmsg::version_string() << ", " << e.what() << "\n";
  return major == IBMSG_VERSION_MAJOR && minor == IBMSG_VERSION_MINOR && patch >= 0 &&
                 e.code() == IBMSG_ETIMEDOUT && std::string(e.what()) == ibmsg_strerror(IBMSG_ETIMEDOUT)
             ? 0
             : 1;
}
