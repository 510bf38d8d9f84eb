"""The paper's experiments (Section 5) on the emulated engine, driven on its simulated clock.

* `workloads`: the queues (stars, chains, 3-ary trees, one cluster bidding, a user's file);
* `orders`: dfs-bid, dfs-uniform, bid-sort and no-sort, batch by batch;
* `runner`: serves a queue on the server's `EngineSimulator` and measures each order;
* `metrics`: welfare on the realized order, standard errors;
* `autobidding`: Figure 4, the SDK's pacing bidders over repeated auctions;
* `plan`, `suite`: which sweeps make each figure, and a whole run end to end;
* `figures`, `headlines`, `report`: the plots, the paper-vs-ours table, JSON and markdown.

`inference-auction experiment` is the command line over `suite.run`. Submodules are imported
on use, so importing one does not load matplotlib.
"""
