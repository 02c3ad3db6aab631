"""Command-line tools (``autosp-opt``, ``autosp-plan``) and the generators of the reference docs."""
