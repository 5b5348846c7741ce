"""Several engines behind one router: the replica views the `route` hook sees (`view`), the router
that calls it (`router`) and the simulated cluster on one virtual clock (`simulation`)."""
