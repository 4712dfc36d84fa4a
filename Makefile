# idempotency: PGXS build of the extension, plus the project's commands.
#   make / make install   build and install the module and its SQL
#   make test             set up everything and run every suite (see test/run.sh)
#   make demo             the at-least-once demo on a throwaway cluster
#   make bench            benchmarks against plain SQL and PL/pgSQL

EXTENSION = idempotency
MODULE_big = idempotency
OBJS = $(patsubst %.cpp,%.o,$(sort $(wildcard src/core/*.cpp) $(wildcard src/pg/*.cpp)))
DATA = $(wildcard src/extension/*.sql)

# The newest installed PostgreSQL unless told otherwise.
PG_CONFIG ?= $(lastword $(sort $(wildcard /usr/lib/postgresql/*/bin/pg_config)) pg_config)
PG_CPPFLAGS = -Isrc -isystem $(shell $(PG_CONFIG) --includedir-server 2>/dev/null)
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

.PHONY: test demo bench
test:
	bash test/run.sh
demo:
	bash test/demo/run.sh
bench:
	bash test/bench/run.sh
