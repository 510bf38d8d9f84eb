"""`python -m inference_auctions.server.cli`: the `inference-auction` command."""

from inference_auctions.server.cli import main

main()
