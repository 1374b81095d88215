"""A run's code, shipped with it (issue 41, ``astra astraeus submit --workdir``): archives stored
once per workspace by their SHA-256, named by runs, fetched by the machines that run them."""
