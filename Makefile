# Quick start from a fresh clone (Debian 12, as root):
#   make demo    install what is missing, build, show ibmsg-send and ibmsg-recv on a Soft-RoCE VM
#   make check   install what is missing, build, run the unit tests and (in the VM) the
#                integration tests
# This file only bootstraps: it installs the build dependencies, runs autoreconf and configures
# out of tree in $(BUILD), then hands every target to the automake Makefile there. The usual
# `autoreconf -fi && ./configure && make` works as well (and replaces this file in your tree).

BUILD ?= build
CONFIGURE_FLAGS ?=
# Debian packages the build and the tests need (the Soft-RoCE rig installs its own); protobuf-c
# is for the example ibmsg-rpc only (configure skips it without).
DEPS = g++ make autoconf automake libtool pkg-config librdmacm-dev libibverbs-dev libev-dev \
       libcmocka-dev mandoc doxygen protobuf-c-compiler libprotobuf-c-dev clang python3

.DEFAULT_GOAL := all
.PHONY: deps configure all check demo install uninstall distcheck dist clean distclean doc

deps:
	@missing=""; for p in $(DEPS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "ibmsg: missing packages:$$missing (run as root, or: sudo apt-get install$$missing)" >&2; exit 1; fi; \
	  echo "ibmsg: installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing || \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; }; \
	fi

configure: configure.ac Makefile.am
	autoreconf -fi

$(BUILD)/Makefile: configure Makefile.in
	mkdir -p $(BUILD) && cd $(BUILD) && ../configure $(CONFIGURE_FLAGS)

Makefile.in: Makefile.am configure.ac
	autoreconf -fi

all check demo install uninstall distcheck dist doc: deps
	$(MAKE) $(BUILD)/Makefile
	$(MAKE) -C $(BUILD) $@

clean distclean:
	[ ! -f $(BUILD)/Makefile ] || $(MAKE) -C $(BUILD) $@

# Anything else goes to the automake Makefile as it is.
%: deps
	$(MAKE) $(BUILD)/Makefile
	$(MAKE) -C $(BUILD) $@

# Keep the rule above from trying to rebuild this file or the autotools inputs.
Makefile configure.ac Makefile.am: ;
