"""The web side: routes (kept thin), what each page shows, the JSON API, SSE, auth and limits."""
