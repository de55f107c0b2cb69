module agui-serve/reverse-proxy

go 1.19
