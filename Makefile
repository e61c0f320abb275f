# Binôme: `make run` starts the whole portal on embedded defaults; `make test` runs every test against PostgreSQL
# and Redis. Both set themselves up from a fresh clone (virtual environment, packages, translations, database).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1
ANVIL_PORT ?= 8545

# make test: real services on 127.0.0.1 (.ci/run starts them when they are down).
TEST_DATABASE_URL ?= postgres://root@127.0.0.1:5432/binome
TEST_REDIS_URL ?= redis://127.0.0.1:6379/9
# pytest runs on PYTEST_WORKERS pytest-xdist workers: the tests that use this machine as their GPU host run in turn on
# one of them (tests/scheduling.py), the compose stack's in turn on another, the rest of the suite on all. The host's
# tests mostly wait (SSH, podman), so two workers beside them keep both cores busy (docs/architecture.md, "The suite
# on several workers").
# PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 3

.PHONY: run test test-image setup setup-run run-deps system-deps lock messages translations contracts screenshots lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# `make run` installs what the demo needs: the project with its `embedded` extra (SQLAlchemy's broker, honcho).
# `make test` (and lint, bench) adds the rest: `dev` (pytest, Playwright, ruff) and `trial` (PyTorch).
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[embedded]"
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,trial,embedded]"
	touch $@ $(VENV)/.installed-run

# npm packages: anvil (the local chain) and solc (compiles payments/contracts/*.sol).
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Debian packages the build and the tests need: gettext (compilemessages), openssh-server, the ssh client and sudo
# (the provisioning tests run a real sshd on 127.0.0.1 and log in as root and as a sudoer), chromium (the browser
# journeys: Playwright drives Debian's Chromium, never a downloaded browser), redis-server (the fault tests stop
# and start a Redis of their own), wrk (the C load generator of `make bench`: a Python client saturates first),
# podman with runc (crun fails on this kernel's cgroup layout), mmdebstrap (bin/test-image builds the
# containers' test image from Debian packages: no registry is reachable), e2fsprogs (each order's data volume is an
# ext4 file system), curl (the forward tests), nginx (tests/portal/test_nginx.py runs deploy/nginx.conf; its
# service is never started), openssl (the proxy's tests make a local CA), a docker client (its own parser checks the
# docker commands; the machine image may ship one, else Debian's docker.io, whose daemon the tests never start), Pango and the DejaVu fonts (WeasyPrint
# prints the fiscal invoices to PDF/A-3 with them, fonts embedded), shellcheck (a test runs it on every shell script,
# on disk and sent to the hosts).
# What `make run` needs of Debian: gettext (compilemessages), Pango and the DejaVu fonts (the invoices' PDFs).
run-deps:
	@missing=""; \
	command -v msgfmt >/dev/null || missing="$$missing gettext"; \
	/sbin/ldconfig -p | grep -q 'libpangoft2-1.0.so.0 ' || missing="$$missing libpango-1.0-0 libpangoft2-1.0-0"; \
	test -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf || missing="$$missing fonts-dejavu-core"; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

system-deps: run-deps
	@missing=""; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v ssh >/dev/null || missing="$$missing openssh-client"; \
	command -v sudo >/dev/null || missing="$$missing sudo"; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v podman >/dev/null || missing="$$missing podman"; \
	command -v runc >/dev/null || missing="$$missing runc"; \
	test -x /usr/libexec/podman/catatonit || missing="$$missing catatonit"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	command -v mkfs.ext4 >/dev/null || missing="$$missing e2fsprogs"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	command -v docker >/dev/null || missing="$$missing docker.io"; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

locale/fr/LC_MESSAGES/django.mo: locale/fr/LC_MESSAGES/django.po | run-deps $(VENV)/.installed-run
	DEBUG=1 $(BIN)/python manage.py compilemessages --locale fr --ignore '.venv' --ignore 'node_modules' -v 0

messages: locale/fr/LC_MESSAGES/django.mo

# The French catalogue refreshed from the code and templates (then translate what is new or fuzzy, and commit):
# references name files only, so that an edit elsewhere in a file does not churn the catalogue. A test
# (tests/portal/test_translations.py) runs this on a copy of the tree and refuses a catalogue it would change.
translations:
	DEBUG=1 $(BIN)/python manage.py makemessages --locale fr --add-location file --ignore '.venv' \
		--ignore 'node_modules' --ignore 'tests' --ignore 'bench' -v 0

setup-run: run-deps $(VENV)/.installed-run node_modules/.installed messages
	@mkdir -p var/static

setup: system-deps $(VENV)/.installed setup-run

# The provisioning tests' container image, built once and cached (/var/cache/binome/images, then podman's store).
test-image: system-deps
	bin/test-image

run: export DEBUG = 1
run: export PORT := $(PORT)
run: export HOST := $(HOST)
run: export SITE_URL := http://$(HOST):$(PORT)
run: export ANVIL_PORT := $(ANVIL_PORT)
run: export DEMO_RPC_URL := http://127.0.0.1:$(ANVIL_PORT)
run: setup-run
	$(BIN)/python manage.py migrate --no-input -v 0
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py prepare_broker -v 0
	$(BIN)/python manage.py collectstatic --no-input -v 0
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start --procfile Procfile --port $(PORT)

test: export DEBUG = 1
test: export DATABASE_URL = $(TEST_DATABASE_URL)
test: export REDIS_URL = $(TEST_REDIS_URL)
test: setup test-image
	$(BIN)/ruff check .
	$(BIN)/python manage.py makemigrations --check --dry-run -v 0
	$(BIN)/pytest --numprocesses $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The README's screenshots: the browser journeys save one per page into test-artifacts/, copied to docs/img/.
screenshots: export DEBUG = 1
screenshots: export DATABASE_URL = $(TEST_DATABASE_URL)
screenshots: export REDIS_URL = $(TEST_REDIS_URL)
screenshots: setup
	$(BIN)/pytest -q tests/browser
	mkdir -p docs/img
	cp test-artifacts/researcher-paid.png docs/img/order-paid.png
	cp test-artifacts/console-provisioned.png docs/img/console-provisioned.png
	cp test-artifacts/researcher-ready.png docs/img/order-ready.png
	cp test-artifacts/commande-fr.png docs/img/commande-fr.png

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python bench/patterns.py
	$(BIN)/python bench/pages.py
	$(BIN)/python bench/chain_scan.py
	$(BIN)/python bench/provisioning.py
	$(BIN)/python bench/ssh_round_trips.py
	$(BIN)/python bench/load.py

# The production image's packages, pinned with their hashes (Dockerfile: pip --require-hashes), from pyproject.toml's
# `dependencies` and their bounds: run after changing them, or to take updates (docs/operations.md, "Updates").
lock: setup
	$(BIN)/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_36 --custom-compile-command "make lock" --annotation-style line -o requirements.lock

contracts: node_modules/.installed
	npm run --silent build:contracts

clean:
	rm -rf $(VENV) var node_modules locale/*/LC_MESSAGES/*.mo
