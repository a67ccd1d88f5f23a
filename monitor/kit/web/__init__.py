"""The web server of the kit: HTTP/1.1 parsing (http11), connection steps (httpconn), the server with
its priority lane (httpd), TLS and basic auth from an exporter-toolkit web-config file (webconfig)."""
