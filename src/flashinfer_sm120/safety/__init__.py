"""The boundary (docs/threat-model.md): input formats, trust and ownership, bounded processes, files.  Imports nothing above it."""
