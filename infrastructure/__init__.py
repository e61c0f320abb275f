"""The ground floor: what every layer may use and that uses none of them (docs/architecture.md, "Layers").

Cache backends (`cache`: Redis, degraded rather than down; `embedded_cache`: one SQLite file for `make run`), log
and error-report redaction of order tokens (`redaction`), the client's address behind trusted proxies (`client`),
single-row settings models (`singleton`) and whole numbers typed by people (`numbers`). Nothing here imports an
app, the pages or the project's settings module: only Django's and third-party libraries.
"""
