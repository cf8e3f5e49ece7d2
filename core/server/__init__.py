"""``sdplan serve`` below its command: the APIs image clients speak (:mod:`.apis`, :mod:`.http`),
the models served and swapped (:mod:`.models`), the shared queue (:mod:`.queue`), the device
groups that run it (:mod:`.groups`), the limits (:mod:`.limits`), pictures in and out
(:mod:`.pictures`) and the server itself with its metrics (:mod:`.service`)."""
