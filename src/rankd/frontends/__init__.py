"""Front-ends: REST, live feed and TCP, all calling the engine."""
