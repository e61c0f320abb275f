# Binôme production image: gunicorn + whitenoise (bin/web by default), the same image runs bin/worker and bin/beat.
# docker-compose.yml builds it; settings come from the environment (README.md, "Configuration").
FROM python:3.11-slim-bookworm

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

RUN groupadd --system binome \
    && useradd --system --gid binome --home-dir /app --no-create-home --shell /usr/sbin/nologin binome

WORKDIR /app

# Runtime dependencies first (cached while pyproject.toml is unchanged), then the project itself. Only
# `project.dependencies`: the extras (`embedded`: SQLAlchemy and honcho for `make run`; `dev`: the tests; `trial`:
# PyTorch for the GPU-node tools) stay out of the image (tests/portal/test_dependencies.py runs the portal so).
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install --no-cache-dir --no-deps . \
    && rm -rf build ./*.egg-info

# Build-time only: DEBUG=1 lets settings import without a SECRET_KEY; collectstatic runs with DEBUG off (and a
# throwaway key that never reaches a running container) so that whitenoise's manifest storage writes the
# hashed, compressed files and staticfiles.json. var/ is where celery beat keeps its schedule file
# (CELERY_BEAT_SCHEDULE_FILENAME): the only directory the app user writes to.
RUN DEBUG=1 python manage.py compilemessages --locale fr --ignore .venv \
    && DEBUG=0 SECRET_KEY=build-only-OlzboJfGStuZjAe8lOpUU8jFC0TCGy9TtNkjxv1jvd1mClpEM \
        python manage.py collectstatic --no-input -v 1 \
    && mkdir -p /app/var \
    && chown binome:binome /app/var

USER binome

EXPOSE 8000
CMD ["bin/web"]
