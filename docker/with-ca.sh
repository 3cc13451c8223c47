#!/bin/sh
# Runs a fetching build step with the CA bundle handed in as the BuildKit secret `ca_bundle` (a host behind a
# TLS-intercepting proxy: `--secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt`). The secret is mounted for
# this one step only, so it never lands in a layer; without it the image's own CA store is used.
if [ -s /run/secrets/ca_bundle ]; then
  export PIP_CERT=/run/secrets/ca_bundle SSL_CERT_FILE=/run/secrets/ca_bundle CURL_CA_BUNDLE=/run/secrets/ca_bundle \
    REQUESTS_CA_BUNDLE=/run/secrets/ca_bundle
fi
exec "$@"
