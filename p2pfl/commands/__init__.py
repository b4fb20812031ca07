"""The `p2pfl` commands, one module each (or one per family): each module's `add(sub)` declares
its subcommands' arguments and sets `handler` (and, where a stop can be resumed, `resume_hint`);
`p2pfl.cli` is the table that lists them and the one place exit codes are decided.

A command parses, checks what only it knows, then calls one layer down; nothing below imports it.
"""
