"""Optional accelerators of the runtime: each one a speed-up, none needed for correctness.

Batches across DataLoader workers in shared slots (``slots``), copy lanes (``lanes``) and the next
pass read ahead (``nextpass``). Each yields the same batches, bit for bit, as the path without it.
"""
