"""The life of a request: admission, the pool, clearing, dispatch ahead of the commit, dispatch
and following its stream to a durable outcome. `service.AuctionService` owns the walk."""
