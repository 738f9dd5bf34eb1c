"""The one error type that stages turn into a single clear line and a non-zero exit."""


class KernelcampError(Exception):
    """A problem the user can fix: the message says what is wrong and what to do instead.

    Stage scripts catch it in ``kernelcamp.io.stage_main`` and print ``error: <message>`` to stderr
    with exit status 2; anything else is a bug and keeps its traceback.
    """


def as_written(value: object) -> str:
    """A config value in an error message as the user wrote it in YAML: ``null`` for None, ``true`` and
    ``false`` for booleans, else its repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


def url_shown(url: str) -> str:
    """``url`` as a message or a record may show it: a password in its user information becomes ``***``
    (``http://me:s3cret@host:8000`` -> ``http://me:***@host:8000``), also in a URL too malformed to parse
    (``http://me:s3cret@[::1``); anything else is returned unchanged. Raises nothing."""
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if not (sep and at and colon):
        return url
    return f"{scheme}://{user}:***@{host}{slash}{tail}"
