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
# Regress suites: sql/NAME.sql with expected/NAME.out, run by installcheck in the order of
# sql/schedule (pg_regress --schedule; defined below, PGXS's own runs only REGRESS). REGRESS names
# the suites the schedule lists (PGXS uses it for the test database and `make clean`).
REGRESS_SCHEDULE = sql/schedule
REGRESS   := $(shell sed -n 's/^test:[[:space:]]*//p' $(REGRESS_SCHEDULE))
REGRESS_OPTS = --load-extension=$(EXTENSION)
NO_INSTALLCHECK = 1
SHLIB_LINK = -lrdkafka -lcurl -lcrypto -lrabbitmq -lavro -lprotobuf -lstdc++
EXTRA_CLEAN = tools/devbroker/eventbox-devbroker build $(OBJS:.o=.d)

PG_CONFIG ?= pg_config
# Our sources are C++; PostgreSQL's bitcode (JIT inlining) rules would need clang for them.
override with_llvm = no
PG_CPPFLAGS = -I$(srcdir)/src -isystem $(shell $(PG_CONFIG) --includedir-server) -DEVENTBOX_VERSION='"$(EXTVERSION)"'
PG_CXXFLAGS = -std=c++17 -fPIC -Wall -Wextra -Werror -Wno-missing-field-initializers -MMD -MP

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Header dependencies (-MMD): an object is rebuilt when a header it includes changes. The
# version is compiled in (-DEVENTBOX_VERSION): every object is rebuilt when the control file
# changes, or a library built before a release bump would report the old version.
-include $(OBJS:.o=.d)
$(OBJS): $(EXTENSION).control

# installcheck runs the schedule, after checking that it lists every suite: a sql/*.sql left
# out of it would never run. Also refused: a listed suite without its sql or expected file, a
# suite listed twice, an expected output (NAME.out or the alternative NAME_N.out) of no suite.
REGRESS_SUITES = $(sort $(basename $(notdir $(wildcard sql/*.sql))))

.PHONY: regress-schedule-check
regress-schedule-check:
	@rc=0; \
	for t in $(REGRESS_SUITES); do \
	  case " $(REGRESS) " in *" $$t "*) ;; \
	    *) echo "$(REGRESS_SCHEDULE) does not list the suite sql/$$t.sql" >&2; rc=1 ;; esac; \
	done; \
	for t in $(REGRESS); do \
	  for f in sql/$$t.sql expected/$$t.out; do \
	    [ -f "$$f" ] || { echo "$(REGRESS_SCHEDULE) lists $$t, but $$f is missing" >&2; rc=1; }; \
	  done; \
	done; \
	[ $(words $(REGRESS)) -eq $(words $(sort $(REGRESS))) ] || \
	  { echo "$(REGRESS_SCHEDULE) lists a suite twice" >&2; rc=1; }; \
	for f in expected/*.out; do \
	  b=$${f##*/}; b=$${b%.out}; \
	  case " $(REGRESS) " in *" $$b "*|*" $${b%_[0-9]} "*) ;; \
	    *) echo "$$f belongs to no suite of $(REGRESS_SCHEDULE)" >&2; rc=1 ;; esac; \
	done; \
	exit $$rc

installcheck: regress-schedule-check
	$(pg_regress_installcheck) $(REGRESS_OPTS) --schedule=$(srcdir)/$(REGRESS_SCHEDULE)

DEVBROKER = tools/devbroker/eventbox-devbroker
$(DEVBROKER): tools/devbroker/devbroker.cpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -o $@ $< -lrdkafka -lpthread

# EVENTBOX_NO_DEVBROKER=1 (debian/rules): the extension alone.
ifneq ($(EVENTBOX_NO_DEVBROKER),1)
all: $(DEVBROKER)
endif

.PHONY: deps test demo bench format deb dist
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

# The Debian package postgresql-15-eventbox (debian/), built from a copy of the tree into
# build/deb/ (tools/build_deb.sh; the .deb is build/deb/postgresql-15-eventbox_*.deb).
deb:
	tools/build_deb.sh

# The PGXN archive of the committed tree (META.json): build/dist/pg_eventbox-VERSION.zip with
# everything under pg_eventbox-VERSION/.
dist:
	tools/build_dist.sh

# Rewrites the C++ sources as the lint layer of `make test` checks them (.clang-format).
format:
	clang-format -i $$(git ls-files 'src/*.cpp' 'src/*.hpp' 'test/unit/*.cpp' 'test/unit/*.hpp' 'tools/devbroker/*.cpp')
