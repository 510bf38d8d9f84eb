"""The ledger writer: the serving path's group commits, and the threads they run on."""
