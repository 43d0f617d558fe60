"""The dashboard: a JSON API over the store and a static page, with operator sessions."""
