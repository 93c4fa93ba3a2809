"""Pure rules of the budget service: no broker, no database, no clock reads."""
