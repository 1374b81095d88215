"""A GraphQL request's context: who asks (the principal, from the bearer token), the database,
the clock, and the request's data loaders (each field loads through them, batched per request).
Below the GraphQL types (backend/schema/, whose fields read it) and the resolvers
(backend/resolvers/, which answer the root fields), so the three form no circle."""
