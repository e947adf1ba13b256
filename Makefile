# A thin layer over Meson and Ninja. Each target installs missing Debian
# packages first (as root), or prints the command to do so.
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_OPTS ?=

.PHONY: all deps test-deps demo-deps valgrind-deps check check-asan \
	check-valgrind check-valgrind-all demo bench clean

all: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

deps:
	@scripts/deps.sh build

test-deps:
	@scripts/deps.sh all

# The demo needs the build's packages and python3 only.
demo-deps:
	@scripts/deps.sh demo

valgrind-deps:
	@scripts/deps.sh valgrind

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS)

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) -Db_sanitize=address,undefined -Db_lundef=false $(MESON_OPTS)

check: test-deps $(BUILD)/build.ninja
	ninja -C $(BUILD)
	tests/run $(BUILD)

check-asan: test-deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)
	tests/run $(ASAN_BUILD)

# The unit tests and a subset of the integration tests under valgrind's
# memcheck (tests/valgrind says which, and how long they take); fails on
# any memcheck error. VALGRIND_TESTS="PATTERN ..." chooses others.
check-valgrind: valgrind-deps $(BUILD)/build.ninja
	ninja -C $(BUILD)
	tests/valgrind $(BUILD) $(VALGRIND_TESTS)

# The whole suite under memcheck: about an hour on 2 cores.
check-valgrind-all: valgrind-deps $(BUILD)/build.ninja
	ninja -C $(BUILD)
	tests/valgrind $(BUILD) unit/ integration/

demo: demo-deps all
	scripts/demo.sh $(BUILD)/nbdflow

bench: test-deps all
	bench/run

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
