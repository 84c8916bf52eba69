# The two commands a user needs on a fresh Debian machine (as root):
#   make demo   install what is missing, build, train the Fashion-MNIST CNN on
#               2 local workers
#   make test   install what is missing, build, run the whole test suite
#   make test-asan / make test-tsan   the suite under AddressSanitizer+UBSan
#               (build-asan/) or ThreadSanitizer (build-tsan/); fails on any
#               report (scripts/sanitize-test.sh)
BUILD  ?= build
PREFIX ?= /usr/local
JOBS   ?= $(shell nproc)
CMAKE_FLAGS ?=
ifdef CI
CMAKE_FLAGS += -DDTRAIN_WERROR=ON
endif

.PHONY: all deps deps-test build demo test test-asan test-tsan install bench fuzz clean

all: build

# What building, running and the demo need; the tests add their own tools
# (clang, Prometheus, Chromium, Slurm).
deps:
	@scripts/install-deps.sh

deps-test:
	@scripts/install-deps.sh --test

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DDTRAIN_REQUIRE_ALL=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/dtrain train configs/fashion-cnn.ini --workers 2 --run-dir runs/demo

test: deps-test build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

test-asan: deps-test
	JOBS=$(JOBS) scripts/sanitize-test.sh asan

test-tsan: deps-test
	JOBS=$(JOBS) scripts/sanitize-test.sh tsan

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	@scripts/install-deps.sh --bench
	/usr/bin/python3 bench/train.py --dtrain $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan
