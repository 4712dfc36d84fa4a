# idempotency: PGXS build of the extension, plus the project's commands.
#   make / make install   build and install the module and its SQL
#   make test             set up everything and run every suite (see test/run.sh)
#   make demo             the at-least-once demo on a throwaway cluster
#   make bench            benchmarks against plain SQL and PL/pgSQL
#   make chaos            the long chaos test
#   make fuzz             the differential test on random seeds (SECONDS=600)
#   make test-matrix      the suites against PostgreSQL 15, 17 and 18 (as root)
#   make deb              Debian packages for 15, 17 and 18 into build/deb/

EXTENSION = idempotency
MODULE_big = idempotency
# The build list (sources.txt) names the sources of each part, for this
# build and CMake's.
sources_of = $(shell sed -n '/^\[$(1)\]/,/^\[/{/^src\//p}' sources.txt)
OBJS = $(patsubst %.cpp,%.o,$(call sources_of,core) $(call sources_of,module))
DATA = $(wildcard src/extension/*.sql) src/sql_edition/idempotency_sql.control
# The SQL edition (src/sql_edition/): its two scripts are put together from
# its parts and the schema of the full script above, and its update scripts
# from src/sql_edition/updates/; the extension's are installed, the plain
# ones (for psql -f on a managed server) are only built.
SQL_UPDATES = $(notdir $(wildcard src/sql_edition/updates/*--*.sql))
SQL_EDITION_EXTENSION = build/sql_edition/idempotency_sql--$(IDEM_VERSION).sql \
	$(addprefix build/sql_edition/idempotency_sql--,$(SQL_UPDATES))
SQL_EDITION = $(SQL_EDITION_EXTENSION) build/sql_edition/idempotency-sql--$(IDEM_VERSION).sql \
	$(addprefix build/sql_edition/idempotency-sql--,$(SQL_UPDATES))
DATA_built = $(SQL_EDITION_EXTENSION)

# `make installcheck`: the regression tests (sql/, setup first) and the race
# tests (test/isolation/) against a running server whose configuration has
# test/regress.conf's settings; `make test` runs them so on a throwaway one.
REGRESS = setup $(filter-out setup,$(sort $(basename $(notdir $(wildcard sql/*.sql)))))
ISOLATION = $(sort $(basename $(notdir $(wildcard test/isolation/specs/*.spec))))
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=output_iso

# The newest installed PostgreSQL (by version, not by text) unless told
# otherwise; the one on PATH when none is under /usr/lib/postgresql.
ifeq ($(origin PG_CONFIG),undefined)
PG_CONFIG := $(or $(shell ls -d /usr/lib/postgresql/*/bin/pg_config 2>/dev/null | sort -V | tail -n 1),pg_config)
endif
# The extension's version, named in the module's magic block (PostgreSQL 18 on).
IDEM_VERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
PG_CPPFLAGS = -Isrc -isystem $(shell $(PG_CONFIG) --includedir-server 2>/dev/null) \
	-DIDEM_VERSION='"$(IDEM_VERSION)"'
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Werror -fno-strict-aliasing -MMD -MP
SHLIB_LINK = -lstdc++
# Debian's PGXS would also build LLVM bitcode in C++14 mode; we do not ship it.
override with_llvm = no
EXTRA_CLEAN = $(OBJS:.o=.d) results regression.diffs regression.out output_iso tmp_check build

PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
else
# Before the server headers are installed only the project commands work.
all:
	@echo "PostgreSQL development files are missing: run 'make test' to install them." >&2
	@exit 1
endif

-include $(OBJS:.o=.d)

# idem-relay, the outbox relay (src/relay: libpq and libcurl, no server
# headers), built beside the module and installed into $(pg_config --bindir).
# Its NATS JetStream and RabbitMQ sinks need libnats-dev and librabbitmq-dev;
# without them it is built without that sink, and says so.
RELAY = build/relay/idem-relay
RELAY_OBJS = $(patsubst src/relay/%.cpp,build/relay/%.o,$(call sources_of,relay))
RELAY_NATS := $(shell pkg-config --exists libnats 2>/dev/null && echo yes)
RELAY_AMQP := $(shell pkg-config --exists librabbitmq 2>/dev/null && echo yes)
RELAY_CPPFLAGS = -Isrc -I$(shell $(PG_CONFIG) --includedir 2>/dev/null) \
	$(shell pkg-config --cflags libcurl 2>/dev/null) -DIDEM_VERSION='"$(IDEM_VERSION)"' \
	$(if $(RELAY_NATS),-DIDEM_RELAY_NATS $(shell pkg-config --cflags libnats)) \
	$(if $(RELAY_AMQP),-DIDEM_RELAY_AMQP $(shell pkg-config --cflags librabbitmq))
RELAY_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -pthread -MMD -MP
RELAY_LIBS = -L$(shell $(PG_CONFIG) --libdir 2>/dev/null) -lpq \
	$(or $(shell pkg-config --libs libcurl 2>/dev/null),-lcurl) \
	$(if $(RELAY_NATS),$(shell pkg-config --libs libnats)) \
	$(if $(RELAY_AMQP),$(shell pkg-config --libs librabbitmq)) -pthread
ifneq ($(RELAY_NATS)$(RELAY_AMQP),yesyes)
$(info idem-relay: built without the $(if $(RELAY_NATS),,nats:// sink (install libnats-dev) )$(if $(RELAY_AMQP),,amqp:// sink (install librabbitmq-dev)))
endif
# The sinks built in are part of the build's identity.
build/relay/.sinks: FORCE
	@mkdir -p $(@D)
	@echo 'nats=$(RELAY_NATS) amqp=$(RELAY_AMQP) version=$(IDEM_VERSION)' | cmp -s - $@ || \
	    echo 'nats=$(RELAY_NATS) amqp=$(RELAY_AMQP) version=$(IDEM_VERSION)' >$@
$(RELAY_OBJS): build/relay/.sinks
.PHONY: FORCE
all: $(RELAY)
install: install-relay
uninstall: uninstall-relay
build/relay/%.o: src/relay/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(RELAY_CPPFLAGS) $(RELAY_CXXFLAGS) -c -o $@ $<
$(RELAY): $(RELAY_OBJS)
	$(CXX) -o $@ $(RELAY_OBJS) $(RELAY_LIBS)
# pg_config --bindir is seldom on PATH: a direct install (no DESTDIR) also
# links the relay from RELAY_LINK_DIR, which is. Packages put it in /usr/bin.
RELAY_LINK_DIR ?= /usr/local/bin
install-relay: $(RELAY)
	$(MKDIR_P) '$(DESTDIR)$(bindir)'
	$(INSTALL_PROGRAM) $(RELAY) '$(DESTDIR)$(bindir)/idem-relay'
	$(if $(DESTDIR)$(filter none,$(RELAY_LINK_DIR)),,$(MKDIR_P) '$(RELAY_LINK_DIR)' && \
	    ln -sf '$(bindir)/idem-relay' '$(RELAY_LINK_DIR)/idem-relay')
uninstall-relay:
	rm -f '$(DESTDIR)$(bindir)/idem-relay'
	$(if $(DESTDIR)$(filter none,$(RELAY_LINK_DIR)),,[ "$$(readlink '$(RELAY_LINK_DIR)/idem-relay')" != '$(bindir)/idem-relay' ] || \
	    rm -f '$(RELAY_LINK_DIR)/idem-relay')
.PHONY: install-relay uninstall-relay
# META.json (the PGXN description) is written from META.json.in with the
# control file's version: `make META.json` after changing it
# (test/matrix/versions_agree.sh fails while they differ).
META.json: META.json.in idempotency.control
	sed 's/@VERSION@/$(IDEM_VERSION)/g' META.json.in >$@
-include $(RELAY_OBJS:.o=.d)
$(SQL_EDITION) &: src/sql_edition/build.sh $(wildcard src/sql_edition/parts/*.sql) \
		$(wildcard src/sql_edition/updates/*--*.sql) src/extension/idempotency--$(IDEM_VERSION).sql
	bash src/sql_edition/build.sh $(IDEM_VERSION) build/sql_edition
.PHONY: sql-edition
sql-edition: $(SQL_EDITION)

.PHONY: test test-matrix deb demo bench chaos fuzz
test:
	bash test/run.sh
test-matrix:
	bash test/matrix/run.sh
deb:
	bash test/matrix/deb.sh
demo:
	bash test/demo/run.sh
bench:
	bash test/bench/run.sh
# The long form of the chaos test (make test runs the short one).
chaos:
	bash -c '. test/lib/common.sh && ensure_packages && build_and_install'
	bash test/chaos/run.sh --long
# The differential test (test/differential/) on random seeds until SECONDS
# have passed, FUZZ_STEPS steps each; prints the seed of any divergence.
# Compared with both references: SQL through the C++ extension, and the
# SQL edition.
SECONDS ?= 600
FUZZ_STEPS ?= 2000
FUZZ_REFERENCES ?= viasql,sqled
fuzz:
	bash -c '. test/lib/common.sh && ensure_packages && build_and_install'
	DIFF_SECONDS=$(SECONDS) DIFF_STEPS=$(FUZZ_STEPS) DIFF_REFERENCES=$(FUZZ_REFERENCES) \
		bash test/differential/run.sh
