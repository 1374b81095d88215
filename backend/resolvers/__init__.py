"""Thin GraphQL resolvers: decode input, check permission, call one service, map to a type."""
