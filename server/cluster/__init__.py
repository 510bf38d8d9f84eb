"""Several auction servers, one per SGLang worker, behind SMG and sharing one ledger.

`replica` holds what a server needs to know about being one of several (its name, its share
of a rate limit, the replica label on its metrics); `supervisor` and `smg` start a whole
deployment on one machine for `inference-auction cluster`.
"""
