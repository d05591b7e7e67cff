// SPDX-License-Identifier: Apache-2.0

// Command refund-client runs the token flow against idem serve, with Go's
// standard library only.
//
// It issues a one-time token (POST /_idem/v1/tokens), submits a refund with
// it, submits it again (Idem answers with the first answer:
// Idempotent-Replayed), then tries another refund with the spent token (409
// token_spent, whose detail is the configuration's text for people). It exits
// 0 when every answer is the one Idem promises, 1 otherwise.
//
//	go run main.go [BASE_URL [SUBJECT [REFUND_NO]]]
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

var client = &http.Client{Timeout: 10 * time.Second}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func post(base, path, subject string, body interface{}, token string) (answer, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return answer{}, err
	}
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(data))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Subject", subject)
	if token != "" {
		req.Header.Set("Idem-Token", token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{resp.StatusCode, resp.Header, raw}, nil
}

func run(base, subject, refundNo string) error {
	refund := map[string]string{"refund_no": refundNo, "amount": "1.00"}

	a, err := post(base, "/_idem/v1/tokens", subject, map[string]string{"scene": "refund"}, "")
	if err != nil {
		return err
	}
	var issued struct {
		Token string `json:"token"`
	}
	if a.status != http.StatusCreated || json.Unmarshal(a.body, &issued) != nil || issued.Token == "" {
		return fmt.Errorf("issue: %d %s", a.status, a.body)
	}
	fmt.Println("token: issued")

	first, err := post(base, "/refunds", subject, refund, issued.Token)
	if err != nil {
		return err
	}
	fmt.Printf("submit: %d %s (kept until %s)\n", first.status, bytes.TrimSpace(first.body),
		first.header.Get("Idempotency-Key-Expires"))
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		return fmt.Errorf("the first submit was not executed")
	}

	again, err := post(base, "/refunds", subject, refund, issued.Token)
	if err != nil {
		return err
	}
	replayed := again.header.Get("Idempotent-Replayed") == "true"
	fmt.Printf("again: %d replayed=%t %s\n", again.status, replayed, bytes.TrimSpace(again.body))
	if again.status != http.StatusCreated || !replayed || !bytes.Equal(again.body, first.body) {
		return fmt.Errorf("the second submit was not the first answer replayed")
	}

	other := map[string]string{"refund_no": refundNo + "-other", "amount": "1.00"}
	spent, err := post(base, "/refunds", subject, other, issued.Token)
	if err != nil {
		return err
	}
	var problem struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal(spent.body, &problem); err != nil {
		return fmt.Errorf("spent token: %d %s", spent.status, spent.body)
	}
	fmt.Printf("spent token: %d %s: %s\n", spent.status, problem.Type, problem.Detail)
	if spent.status != http.StatusConflict || problem.Type != "urn:idem:token_spent" {
		return fmt.Errorf("the spent token was not refused")
	}
	return nil
}

func main() {
	base, subject := "http://127.0.0.1:8080", "alice"
	refundNo := fmt.Sprintf("R-go-%d", time.Now().UnixMilli())
	if len(os.Args) > 1 {
		base = strings.TrimRight(os.Args[1], "/")
	}
	if len(os.Args) > 2 {
		subject = os.Args[2]
	}
	if len(os.Args) > 3 {
		refundNo = os.Args[3]
	}
	if err := run(base, subject, refundNo); err != nil {
		fmt.Println("refund-client:", err)
		os.Exit(1)
	}
}
