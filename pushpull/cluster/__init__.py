"""Membership layer: the scheduler process and the client side every node uses
to register, get the address book, meet at barriers and prove it is alive
(ps-lite's Postoffice)."""
