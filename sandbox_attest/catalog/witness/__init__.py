"""Host witnesses the catalogue's judges share: `kernel` (what the kernel answered a cell).

Named `witness` so that the catalogue's cut (tests/unit/test_import_layers.py: every part
is an area or a shared helper) holds without a new entry; issue 27 named the module
`catalog/kernel_evidence.py`.
"""
