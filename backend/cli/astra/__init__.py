"""``astra astraeus …``: the user's command line. It talks to the API only."""
