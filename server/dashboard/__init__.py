"""The web dashboard: sign-in sessions, ledger-health tracking and the static page."""
