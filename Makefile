# aq — build, test, benchmark, demo. `make test` is what CI runs (.ci/run).
GO       ?= go
BIN      ?= bin/aq
PKG      := github.com/aqfleet/aq
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DATE     ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS  := -s -w -X $(PKG)/internal/version.Version=$(VERSION) \
            -X $(PKG)/internal/version.Commit=$(COMMIT) \
            -X $(PKG)/internal/version.Date=$(DATE)
BENCHTIME ?= 1s
FUZZTIME  ?= 2m
# golangci-lint, pinned: `go run` builds it once into the Go build cache (no
# tool dependencies in go.mod); later runs start at once.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: all build install test unit lint fuzz fmtcheck vet tidycheck crossbuild race selftest bench demo chaos clean sbpeer realcli engines-latest

all: build

## build: a static binary in bin/aq, version stamped
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/aq

## install: go install with the same stamp
install:
	CGO_ENABLED=0 $(GO) install -trimpath -ldflags '$(LDFLAGS)' ./cmd/aq

## test: formatting, vet, the linter, module tidiness, the other platforms'
## builds, race-enabled tests, then aq selftest
test: fmtcheck vet lint tidycheck crossbuild race selftest

## unit: the fast loop — every package's tests with -short (the slow ones
## skip and say why; `make test` runs them), no race detector. Four
## packages at once: much of a package's time is waiting (on intervals,
## processes, git), so two at a time left the two cores half idle (70 s
## against 54-58 s on a quiet 2-core machine, 2026-11-27). No vet (`make
## vet` and `make lint` run it) and no symbol table or DWARF in the test
## binaries (a smaller link; a panic's trace needs neither): docs/BENCHMARKS.md.
## -tags unit: a package whose every test is slow (the ones that run the aq
## binary: cmd/aq/clitest/*, termtest, the demo acts) marks its test files
## `//go:build !unit`, so that it is not linked only to skip: the links were
## most of the loop's time.
unit:
	$(GO) test -short -tags unit -p 4 -vet=off -ldflags='-s -w' ./...

## lint: golangci-lint (.golangci.yml): vet, staticcheck, errcheck, revive,
## misspell, and depguard's layering rule
lint:
	$(GOLANGCI_LINT) run ./...

fmtcheck:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## crossbuild: build and vet the whole module (tests included) for the other
## platforms factories run on, so a platform break fails here on Linux.
## The module has no per-architecture files (only _darwin, _windows, _unix
## ones), so darwin/amd64 is built (its dependencies do differ by
## architecture) but not vetted again: darwin/arm64's vet reads the same files.
CROSS := darwin/arm64 windows/amd64
CROSS_BUILD_ONLY := darwin/amd64
crossbuild:
	@for p in $(CROSS); do \
		echo "build + vet for $$p"; \
		GOOS=$${p%/*} GOARCH=$${p#*/} CGO_ENABLED=0 $(GO) build ./... || exit 1; \
		GOOS=$${p%/*} GOARCH=$${p#*/} CGO_ENABLED=0 $(GO) vet ./... || exit 1; \
	done
	@for p in $(CROSS_BUILD_ONLY); do \
		echo "build for $$p"; \
		GOOS=$${p%/*} GOARCH=$${p#*/} CGO_ENABLED=0 $(GO) build ./... || exit 1; \
	done

tidycheck:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod/go.sum are not tidy: run 'go mod tidy'"; $(GO) mod tidy -diff; exit 1; }

## -timeout is a deadlock guard per package, not a speed limit: on a loaded
## machine a package's race run can come near go test's default 10m (it was
## cmd/aq/cli's, before its binary tests moved to cmd/aq/clitest/...: #35,
## docs/BENCHMARKS.md)
## aq is built once for every test package that runs the binary
## (internal/testenv.PrebuiltEnv), as `make build` ships it: CGO_ENABLED=0,
## no race detector (the tests themselves run with it; docs/architecture.md
## "Tests"). A package run alone builds its own. Its own folder: a test puts
## the binary's folder on PATH to run `aq` by name.
## GORACE: a race-enabled process sleeps a second at exit by default; the
## test binaries, and the helpers they start, need not.
TEST_AQ := $(CURDIR)/bin/test/aq
race: sbpeer realcli
	@$(MAKE) --no-print-directory build BIN=$(TEST_AQ)
	TESTENV_AQ_BINARY=$(TEST_AQ) GORACE=atexit_sleep_ms=0 $(GO) test -race -count=1 -timeout 20m ./...

## selftest: the built binary's self-checks (host readiness + offline pipeline)
selftest: build sbpeer
	./$(BIN) selftest

## sbpeer: the local AMQP 1.0 peer's dependencies (rhea, pinned), when Node is present.
## Without Node the Service Bus wire tests skip with a reason; CI installs Node.
SBPEER_STAMP := demo/sbpeer/node_modules/.package-lock.json
sbpeer:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(SBPEER_STAMP); \
	else echo "note: npm not found: Service Bus wire tests will be skipped"; fi

$(SBPEER_STAMP): demo/sbpeer/package-lock.json demo/sbpeer/package.json
	npm ci --prefix demo/sbpeer --no-audit --no-fund --loglevel=error

## realcli: the real engine CLIs (claude, codex), pinned in realcli,
## that the end-to-end tests run offline against in-tree API fakes. Without
## npm those tests skip with a reason; with npm but no registry this fails.
REALCLI_STAMP := realcli/node_modules/.package-lock.json
realcli:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(REALCLI_STAMP); \
	else echo "note: npm not found: the real-engine tests will be skipped"; fi

$(REALCLI_STAMP): realcli/package-lock.json realcli/package.json
	npm ci --prefix realcli --no-audit --no-fund --loglevel=error

## engines-latest: the end-to-end tests against the newest published claude
## and codex CLIs (opt-in, not part of make test; needs the npm registry):
## they are installed into a temp copy of realcli and the table of
## versions and results is printed (docs/engines.md, "Compatibility").
## RUN=REGEXP narrows the tests.
engines-latest:
	realcli/latest.sh

## fuzz: each native fuzz target for FUZZTIME (default 2m), one after
## another with -parallel 1 (the machine is shared); their seed corpora
## (testdata/fuzz/<target>) run in every `go test`. A crash is written to the
## target's testdata/fuzz and fails the run. FUZZTIME=10s for a quick pass.
## New inputs are minimized for at most 5s (the default minute, on a loaded
## machine with one worker, is a minute of no fuzzing).
FUZZ_TARGETS := ./agent/manifest:FuzzParse ./agent/manifest:FuzzAdmit \
	./agent/fleet:FuzzClaimAnswer ./agent/fleet:FuzzCoordinatorAnswer ./agent/fleet:FuzzSpoolReport \
	./agent/dispatch:FuzzMessage
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s -parallel 1 $$pkg || exit 1; \
	done

## bench: every benchmark, with memory stats
bench: sbpeer
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

## demo: the README's first command — build, then run aq's main job offline
demo: build sbpeer
	./$(BIN) demo

## chaos: the full multi-host chaos run (320 jobs, 4 factories, seeded faults);
## writes docs/RELIABILITY.md. SEED=n replays a run. The reduced run is in make test.
SEED ?= 0
chaos: sbpeer
	$(GO) run ./chaos/cmd/chaos --seed $(SEED) --out docs/RELIABILITY.md

clean:
	rm -rf bin
