"""Worker side: moves KV bytes between media. Imports torch."""
