"""The settings' environment, where every variable `X` may instead be given as `X_FILE=/path` (Docker and compose
secrets, a file mode 0400 rather than a value every process of the container lists in /proc/*/environ).

django-environ's `FileAwareEnv` reads `X_FILE` when the settings read `X`. Three things it does not do, added here:
one trailing line ending is dropped (what an editor or `echo` writes after a secret), a file that cannot be read
stops the start with the variable and the path named (not a FileNotFoundError traceback), and `X` and `X_FILE`
both set is refused, since neither reading of it is obviously the operator's intent. Variables whose value is
itself a path the portal reads (`PAYMENTS_CHAINS_FILE`, `PROVISIONING_SSH_KEY_FILE`) are unaffected: they would only
be taken as file-given if the settings read a variable named without the suffix, which they do not
(tests/portal/test_environment.py checks it).
"""

import environ
from django.core.exceptions import ImproperlyConfigured
from environ.fileaware_mapping import FileAwareMapping

FILE_SUFFIX = "_FILE"


def _without_line_ending(text: str) -> str:
    """`text` less one trailing line ending (`\\n` or `\\r\\n`): a secret never ends with one, a file often does."""
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


class SecretFileMapping(FileAwareMapping):
    """os.environ, with `X` read from the file `X_FILE` names when that one is set (not empty)."""

    def __getitem__(self, key: str) -> str:
        if self.cache and key in self.files_cache:
            return self.files_cache[key]
        path = self.env.get(key + FILE_SUFFIX)
        if not path:
            return self.env[key]
        if self.env.get(key):
            raise ImproperlyConfigured(
                f"{key} and {key}{FILE_SUFFIX} are both set: give the value one way only (unset {key}, or "
                f"{key}{FILE_SUFFIX})."
            )
        try:
            with open(path, encoding="utf-8") as file:
                value = _without_line_ending(file.read())
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise ImproperlyConfigured(
                f"{key}{FILE_SUFFIX}={path!r}: the file cannot be read ({reason}). Give the path of a file readable "
                f"by this process's user, or set {key} instead."
            ) from None
        except UnicodeDecodeError:
            raise ImproperlyConfigured(f"{key}{FILE_SUFFIX}={path!r}: the file is not UTF-8 text.") from None
        if self.cache:
            self.files_cache[key] = value
        return value


class SecretFileEnv(environ.FileAwareEnv):
    ENVIRON = SecretFileMapping()
