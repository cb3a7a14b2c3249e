# pg_eventbox: PGXS build plus the project's entry points (make test, make demo, make bench).
EXTENSION  = pg_eventbox
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big = pg_eventbox
# Sources are listed once, in src/sources.txt (also read by CMakeLists.txt): pure C++ (no
# postgres.h) and PostgreSQL-side files, in folders by subsystem.
PURE_SRCS  = $(addprefix src/,$(shell awk '$$1 == "pure" { print $$2 }' src/sources.txt))
PG_SRCS    = $(addprefix src/,$(shell awk '$$1 == "pg" { print $$2 }' src/sources.txt))
OBJS       = $(PURE_SRCS:.cpp=.o) $(PG_SRCS:.cpp=.o)
DATA       = $(wildcard extension/$(EXTENSION)--*.sql)
REGRESS    = $(sort $(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --load-extension=$(EXTENSION)
SHLIB_LINK = -lrdkafka -lcrypto -lstdc++
EXTRA_CLEAN = tools/devbroker/eventbox-devbroker build $(OBJS:.o=.d)

PG_CONFIG ?= pg_config
# Our sources are C++; PostgreSQL's bitcode (JIT inlining) rules would need clang for them.
override with_llvm = no
PG_CPPFLAGS = -I$(srcdir)/src -isystem $(shell $(PG_CONFIG) --includedir-server) -DEVENTBOX_VERSION='"$(EXTVERSION)"'
PG_CXXFLAGS = -std=c++17 -fPIC -Wall -Wextra -Werror -Wno-missing-field-initializers -MMD -MP

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Header dependencies (-MMD): an object is rebuilt when a header it includes changes.
-include $(OBJS:.o=.d)

DEVBROKER = tools/devbroker/eventbox-devbroker
$(DEVBROKER): tools/devbroker/devbroker.cpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -o $@ $< -lrdkafka -lpthread

all: $(DEVBROKER)

.PHONY: deps test demo bench format
deps:
	tools/deps.sh

test: deps
	$(MAKE) all
	$(MAKE) install
	tools/run_tests.sh

demo: deps
	$(MAKE) all
	$(MAKE) install
	tools/demo.sh

bench: deps
	$(MAKE) all
	$(MAKE) install
	bench/run.sh

format:
	clang-format -i src/*/*.cpp src/*/*.hpp test/unit/*.cpp tools/devbroker/*.cpp
