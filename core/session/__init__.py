"""The desktop session without Qt: the board's state (devices, model files, profile, plan,
fit, generation settings) and every operation on it (:class:`~sdplan.core.session.board.Session`),
what a pasted command, a picture or a saved plan brings (:mod:`~sdplan.core.session.imports`),
and a run's request and record (:mod:`~sdplan.core.session.runs`). The app's controller wraps
a session in Qt signals and an undo stack; tests and the command line use it as it is.
"""
