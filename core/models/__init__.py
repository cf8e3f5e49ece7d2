"""graph definitions, one file per architecture."""
