"""DraftDeck's web app: settings, SQL tables, job state, HTML pages and the JSON API."""
