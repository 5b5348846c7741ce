"""Several engines behind one router: the replica views the `route` hook sees (`view`), the router
that calls it (`router`), the simulated cluster on one virtual clock (`simulation`) and its result
document (`document`)."""
