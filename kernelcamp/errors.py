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
