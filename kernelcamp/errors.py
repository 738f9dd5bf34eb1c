"""The one error type that stages turn into a single clear line and a non-zero exit."""


class KernelcampError(Exception):
    """A problem the user can fix: the message says what is wrong and what to do instead.

    Stage scripts catch it in ``kernelcamp.io.stage_main`` and print ``error: <message>`` to stderr
    with exit status 2; anything else is a bug and keeps its traceback.
    """


class AnotherRunError(KernelcampError):
    """A pipeline run refused because another live ``dvc`` run holds the workspace (:mod:`kernelcamp.runlock`).
    Nothing of the refused run ran, and params.yaml by then holds the other run's params (put back for it), so
    ``kernelcamp.tracking.tracked_stage`` records no MLflow run of it: a FAILED run named the running run's params
    under the refused one's experiment name (helper-65)."""


def as_written(value: object) -> str:
    """A config value in an error message as the user wrote it in YAML: ``null`` for None, ``true`` and
    ``false`` for booleans, else its repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


def url_shown(url: str) -> str:
    """``url`` as a message or a record may show it: a password in its user information becomes ``***``
    (``http://me:s3cret@host:8000`` -> ``http://me:***@host:8000``). The user information is taken to end at the
    string's last ``@``, so that a password holding ``/``, ``?``, ``#`` or ``@`` unencoded is hidden whole too, also in
    a URL too malformed to parse (``http://me:s3cret@[::1``, ``http:///me:s3cret@host``); the price is that an ``@``
    later in a URL (in a path) hides what comes before it. Anything without a password is returned unchanged.
    Raises nothing."""
    scheme, colon, rest = url.partition(":")
    if not colon or "@" not in rest:
        return url
    body = rest.lstrip("/")
    userinfo, _, host = body.rpartition("@")
    user, has_password, _password = userinfo.partition(":")
    if not has_password:
        return url
    return f"{scheme}:{rest[: len(rest) - len(body)]}{user}:***@{host}"


def text_shown(text: str, url: str) -> str:
    """``text`` (an error's message) with every copy of ``url`` in it as :func:`url_shown` shows it. Raises
    nothing."""
    return text.replace(url, url_shown(url))


#: What torch's allocators say when an allocation fails: ``DefaultCPUAllocator: can't allocate memory`` (or ``not
#: enough memory``) on a CPU, ``torch.OutOfMemoryError``'s ``CUDA out of memory`` on a GPU.
_OOM_WORDS = ("can't allocate memory", "not enough memory", "out of memory")


def out_of_memory(e: BaseException) -> KernelcampError | None:
    """A one-line ``KernelcampError`` for an allocation that failed (``MemoryError``, ``torch.OutOfMemoryError``,
    or a ``RuntimeError`` of torch's CPU allocator), naming the request's size and the params that set it; None for
    any other exception (which keeps its traceback: a bug). A cache of ``num_cache_tokens`` rows is the largest
    allocation of a run (656 bytes a token for DeepSeek-V3.2's fp8 layout). Raises nothing."""
    import re

    text = str(e)
    if not (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and any(w in text for w in _OOM_WORDS)
    )):  # fmt: skip
        return None
    m = re.search(
        r"tried to allocate ([0-9.]+ ?[A-Za-z]*)", text, re.IGNORECASE
    )  # CUDA's: "Tried to allocate 2.00 GiB"
    what = f"tried to allocate {m.group(1)}" if m else type(e).__name__
    return KernelcampError(
        f"out of memory ({what}): the run's shapes do not fit this machine; lower workload.num_cache_tokens "
        "(server.num_cache_tokens, or server.cpu_cache_tokens for a server on a CPU) or the batch sizes"
    )
