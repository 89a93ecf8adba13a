"""Deploy: the command line, local launcher, lab and production files."""
