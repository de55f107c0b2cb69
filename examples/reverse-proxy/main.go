// A reverse proxy in front of agui-serve built on httputil.ReverseProxy, following the
// reverse-proxy contract in agui-serve's docs/operations.md (Behind a reverse proxy):
//
//   - streaming: FlushInterval -1 writes every SSE frame as soon as it arrives;
//   - token: any `?token=` from the browser is stripped and the daemon's own token is set
//     as `Authorization: Bearer ...` (the browser never sees it);
//   - origin: the browser's Origin is not forwarded (this proxy is the trust boundary;
//     agui-serve checks no origin on server-to-server requests);
//   - /info URLs: Host is passed through and X-Forwarded-Proto set, so agent URLs in
//     /info name this proxy;
//   - body limit: requests over 8 MiB are refused here too.
//
// With -static DIR it also serves a built web page (e.g. the CopilotKit example built for
// direct mode) for every path outside -path, so the page and its runtimeUrl share one
// origin and the browser holds no token at all. A file the build also wrote compressed
// (FILE.br, FILE.gz) is sent that way, with Content-Encoding, to a browser that accepts it.
//
// Usage: AGUI_TOKEN=... go run . -listen 127.0.0.1:8080 -upstream http://127.0.0.1:8443
//
//	[-upstream-ca cert.pem] [-path /agui] [-static dist]
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"log"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"strings"
)

const maxBody = 8 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:8443", "agui-serve base URL")
	upstreamCA := flag.String("upstream-ca", "", "PEM certificate to trust for an https upstream (agui-serve's generated one)")
	prefix := flag.String("path", "/agui", "agui-serve's route namespace: requests under it are proxied")
	static := flag.String("static", "", "directory of a built page served for every other path")
	flag.Parse()
	token := os.Getenv("AGUI_TOKEN")
	if token == "" {
		log.Fatal("AGUI_TOKEN is required")
	}
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("bad -upstream: %v", err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	if *upstreamCA != "" {
		pem, err := os.ReadFile(*upstreamCA)
		if err != nil {
			log.Fatalf("bad -upstream-ca: %v", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			log.Fatalf("bad -upstream-ca: no certificate in %s", *upstreamCA)
		}
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.TLSClientConfig = &tls.Config{RootCAs: roots}
		proxy.Transport = transport
	}
	direct := proxy.Director
	proxy.Director = func(r *http.Request) {
		host := r.Host
		direct(r)
		// Keep the browser-facing Host so /info builds URLs that name this proxy.
		r.Host = host
		q := r.URL.Query()
		q.Del("token")
		r.URL.RawQuery = q.Encode()
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Del("Origin")
		r.Header.Del("Cookie")
		proto := "http"
		if r.TLS != nil {
			proto = "https"
		}
		r.Header.Set("X-Forwarded-Proto", proto)
	}
	proxy.FlushInterval = -1
	var files http.Handler
	if *static != "" {
		files = staticFiles(*static)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		underPrefix := r.URL.Path == *prefix || strings.HasPrefix(r.URL.Path, *prefix+"/")
		if files != nil && !underPrefix {
			files.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > maxBody {
			http.Error(w, `{"code":"PAYLOAD_TOO_LARGE","message":"request body exceeds 8 MiB"}`, http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		proxy.ServeHTTP(w, r)
	})
	log.Printf("proxying %s -> %s", *listen, target)
	log.Fatal(http.ListenAndServe(*listen, handler))
}

// staticFiles serves dir like http.FileServer, but sends FILE.br or FILE.gz (written next to
// FILE by the page's build) with Content-Encoding when the request accepts that encoding:
// compressed once at build time, never per request.
func staticFiles(dir string) http.Handler {
	root := http.Dir(dir)
	files := http.FileServer(root)
	encodings := []struct{ name, suffix string }{{"br", ".br"}, {"gzip", ".gz"}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Vary", "Accept-Encoding")
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			name := path.Clean("/" + r.URL.Path)
			for _, encoding := range encodings {
				if !accepts(r.Header.Get("Accept-Encoding"), encoding.name) {
					continue
				}
				f, err := root.Open(name + encoding.suffix)
				if err != nil {
					continue
				}
				info, err := f.Stat()
				if err != nil || info.IsDir() {
					f.Close()
					continue
				}
				ctype := mime.TypeByExtension(path.Ext(name))
				if ctype == "" {
					ctype = "application/octet-stream"
				}
				w.Header().Set("Content-Type", ctype)
				w.Header().Set("Content-Encoding", encoding.name)
				http.ServeContent(w, r, name, info.ModTime(), f)
				f.Close()
				return
			}
		}
		files.ServeHTTP(w, r)
	})
}

// accepts reports whether an Accept-Encoding header allows the encoding (listed, and not
// with q=0).
func accepts(header, encoding string) bool {
	for _, part := range strings.Split(header, ",") {
		fields := strings.Split(part, ";")
		if !strings.EqualFold(strings.TrimSpace(fields[0]), encoding) {
			continue
		}
		for _, param := range fields[1:] {
			param = strings.ReplaceAll(strings.TrimSpace(param), " ", "")
			if param == "q=0" || strings.HasPrefix(param, "q=0.") && strings.Trim(param[4:], "0") == "" {
				return false
			}
		}
		return true
	}
	return false
}
