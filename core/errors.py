"""sdplan's error hierarchy: every failure a user can cause is one of these.

- :class:`PlanError`: a placement string or flag is wrong (stable ``code`` from the spec,
  ``flag`` and half-open character ``span`` into that flag's joined value).
- :class:`ModelFileError`: a model file cannot be read or understood (names the file).
- :class:`EngineError`: running a module failed (names the device and module).
- :class:`InventoryError`: a device inventory cannot be read.
- :class:`InvalidArgument`: a command-line value is out of range or inconsistent.
- :class:`OutputError`: an output location cannot be written.
- :class:`PathError`: a path cannot be used at all (too long, no permission, a loop of
  links...): names the path; also an :class:`OSError`, so code that reads files catches it.
- :class:`NonFiniteError`: the engine's numbers became NaN or infinite (names the step and
  the likely cause).

The CLI turns any :class:`SdplanError` into a one-line message and exit code 2.
"""

from __future__ import annotations


class SdplanError(Exception):
    """Base of every error sdplan raises on purpose."""

    code: str = "error"

    def to_json(self) -> dict[str, object]:
        """A JSON-ready description: ``{"code", "message"}`` plus subclass fields."""
        return {"code": self.code, "message": str(self)}


class PlanError(SdplanError):
    """A planning error with the spec's stable ``code`` (spec section 11).

    Attributes:
        code: one of the spec's error codes, e.g. ``unknown_module``.
        flag: the flag whose value is wrong (``--backend``...), or None.
        text: the whole (joined) value of that flag, or None.
        span: ``(start, end)`` half-open offsets into ``text``, or None when the entry was
            added by a compatibility flag or the error has no location.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        flag: str | None = None,
        text: str | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.flag = flag
        self.text = text
        self.span = span

    def to_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "message": str(self),
            "span": list(self.span) if self.span is not None else None,
        }


class InventoryError(SdplanError):
    """A device inventory (JSON file or live query) is unusable."""

    code = "invalid_inventory"


class ModelFileError(SdplanError):
    """A model file is unreadable, truncated, hostile or not a model.

    Attributes:
        path: the file (or folder) concerned.
    """

    code = "invalid_model_file"

    def __init__(self, path: object, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class EngineError(SdplanError):
    """Running a module on the engine failed.

    Attributes:
        device: the device concerned, or None.
        module: the module concerned, or None.
    """

    code = "engine_error"

    def __init__(self, message: str, *, device: str | None = None, module: str | None = None):
        where = ", ".join(x for x in (f"module {module}" if module else "",
                                      f"device {device}" if device else "") if x)
        super().__init__(f"{message} ({where})" if where else message)
        self.device = device
        self.module = module


class InvalidArgument(SdplanError):
    """A command-line value is out of range or inconsistent (names the flag)."""

    code = "invalid_argument"


class OutputError(SdplanError):
    """An output location (image, preview folder, history) cannot be written."""

    code = "output_unwritable"


class PathError(SdplanError, OSError):
    """A path that cannot be used: its name is too long, a folder on the way denies
    search permission, a loop of links, an I/O error... (``"PATH: file name too long"``).

    Also an :class:`OSError`: code that catches the errors of reading a file catches this.

    Attributes:
        path: the path concerned.
    """

    code = "bad_path"

    def __init__(self, path: object, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class NonFiniteError(SdplanError):
    """A latent or picture holds NaN or infinite values: the weights, the sigma schedule
    or a LoRA weight made the maths overflow.

    Attributes:
        what: what was checked (``"latent after step 3 of 20"``, ``"decoded picture"``).
        causes: the likely causes found, in the words the message uses.
    """

    code = "non_finite_result"

    def __init__(self, what: str, causes: tuple[str, ...] = ()) -> None:
        self.what = what
        self.causes = tuple(causes)
        why = ("; likely cause: " + "; ".join(causes)) if causes else ""
        super().__init__(f"the {what} holds NaN or infinite values (nothing was written){why}")

    def with_causes(self, causes: tuple[str, ...]) -> NonFiniteError:
        """The same error naming ``causes`` (the first found first)."""
        return NonFiniteError(self.what, tuple(causes))


class RequestRefused(SdplanError):
    """An HTTP request a server refuses before any work: malformed, over a stated limit,
    unauthorised, for a model it does not have, or while its queue is full.

    Attributes:
        code: a stable code (``invalid_json``, ``too_large``, ``queue_full``...).
        status: the HTTP status the server answers with (400, 401, 404, 413, 429...).
    """

    code = "invalid_request"

    def __init__(self, message: str, code: str = "invalid_request", status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
