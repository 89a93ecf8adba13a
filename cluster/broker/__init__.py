"""The broker process: trio server, request handlers, partition registry."""
