"""Certificates as an operator with a CA of their own makes them, with openssl: the proxy's HTTPS tests."""

import subprocess
from pathlib import Path


def certificate_authority(folder: Path, name: str) -> Path:
    """A CA of the test's own, made with openssl as an operator with a CA of their own would."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem"],
        check=True, capture_output=True, cwd=folder,
    )  # fmt: skip
    return folder / f"{name}.pem"


def local_ca(folder: Path) -> Path:
    """A local CA and a certificate it signed for localhost, in the TLS folder as fullchain.pem and privkey.pem (what
    TLS_DIR holds). Returns the CA's certificate."""
    (folder / "tls").mkdir()
    ca = certificate_authority(folder, "local-ca")
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    for argv in (
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
         "-keyout", "tls/privkey.pem", "-out", "site.csr"],
        ["x509", "-req", "-in", "site.csr", "-CA", ca.name, "-CAkey", "local-ca.key", "-CAcreateserial", "-days", "2",
         "-extfile", "san.ext", "-out", "tls/fullchain.pem"],
    ):  # fmt: skip
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=folder)
    return ca
