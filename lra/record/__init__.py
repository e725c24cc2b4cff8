"""Records: one JSON file per run, written atomically; the store that reads them back."""
