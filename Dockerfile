# Binôme production image: gunicorn + whitenoise (bin/web by default), the same image runs bin/worker and bin/beat.
# docker-compose.yml builds it; settings come from the environment (README.md, "Configuration").
# The base: Docker Hub's Python image by default; where no registry is reachable, the one bin/stack-images builds from
# Debian packages (BASE_IMAGE, docker-compose.yml passes it on): it has `python` and `pip` on PATH the same way.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# The project's own packages are pip-installed too; PYTHONPATH puts /app first so that every process (gunicorn,
# celery, manage.py) imports them from /app, where BASE_DIR finds templates/, static/, locale/ and var/ (celery
# only adds the working directory while it imports the app module; the rest would come from site-packages).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    STATIC_ROOT=/app/staticfiles \
    HOST=0.0.0.0 \
    PORT=8000

# gettext: msgfmt, for compilemessages below; Pango and the DejaVu fonts: WeasyPrint prints the fiscal invoices.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gettext \
        libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid and gid (10001): the provisioning key mounted from the host must be owned by it, and a rebuild on
# another base must not change who that is.
RUN groupadd --system --gid 10001 binome \
    && useradd --system --uid 10001 --gid binome --home-dir /app --no-create-home --shell /usr/sbin/nologin binome

WORKDIR /app

# Runtime dependencies first (cached while the lock is unchanged), then the project itself. requirements.lock pins
# `project.dependencies` and everything they need, each file by its SHA-256 (`make lock` writes it): the same
# packages on every build, and a file that changed on the index is refused. Only `project.dependencies`: the extras
# (`embedded`: SQLAlchemy and honcho for `make run`; `dev`: the tests; `trial`: PyTorch for the GPU-node tools) stay
# out of the image (tests/portal/test_dependencies.py runs the portal so).
COPY pyproject.toml requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock

# .dockerignore is an allow-list: the project's code, templates, static files and translations only. No `.env`, no
# key, no chains file (RPC URLs carry API keys: docker-compose.yml mounts it as a secret) ever enters a layer.
COPY . .
RUN pip install --no-cache-dir --no-deps . \
    && rm -rf build ./*.egg-info

# Build-time only: translations compiled, static files collected into whitenoise's manifest storage (hashed and
# compressed files and staticfiles.json, STATIC_MANIFEST=1). Neither reads a database, a broker, a chain or a
# secret, so they run with DEBUG on, whose settings need none (REDIS_URL names a server nothing connects to: without
# it the settings ask for the embedded extra, which the image does not have); nothing of this environment stays in
# the image. var/ is where celery beat keeps its schedule file (CELERY_BEAT_SCHEDULE_FILENAME): the only directory
# the app user writes to.
RUN export DEBUG=1 STATIC_MANIFEST=1 REDIS_URL=redis://build.invalid:6379/0 \
    && python manage.py compilemessages --locale fr --ignore .venv \
    && python manage.py collectstatic --no-input -v 1 \
    && mkdir -p /app/var \
    && chown binome:binome /app/var

USER binome

EXPOSE 8000
CMD ["bin/web"]
