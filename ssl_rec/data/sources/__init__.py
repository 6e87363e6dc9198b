"""Data sources: each file is one source (its reader and its ``ArrowDataModule``)."""
