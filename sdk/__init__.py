"""The inference-auctions client SDK."""
