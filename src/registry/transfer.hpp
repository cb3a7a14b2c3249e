// One HTTP transfer of the Schema Registry client (a schema id's, a subject version's or a
// reference's) and a schema whose references are being fetched, shared by registry.cpp and
// registry_references.cpp. Internal to src/registry/. Pure C++.
#pragma once

#include <curl/curl.h>

#include <string>
#include <vector>

#include "registry/registry.hpp"

namespace eventbox::registry {

struct Registry::Transfer {
    uint32_t id = 0;
    std::string subject_key;           // a subject's version (else schema `id`, or a reference)
    Resolution* resolution = nullptr;  // a reference's: the schema that waits for it
    std::string ref_key;               // ... and its subject version
    CURL* easy = nullptr;
    std::string body;
    std::size_t limit = 0;
    char error[CURL_ERROR_SIZE] = {0};

    // Why the transfer failed: curl's message for `curl_code`, else the HTTP status.
    std::string failure(int curl_code, long status) const {
        if (curl_code == CURLE_OK) return "HTTP status " + std::to_string(status);
        return error[0] ? error : curl_easy_strerror(CURLcode(curl_code));
    }

    static size_t on_data(char* data, size_t size, size_t n, void* self) {
        auto* t = static_cast<Transfer*>(self);
        if (t->body.size() + size * n > t->limit) return 0;  // aborts: too large
        t->body.append(data, size * n);
        return size * n;
    }
};

// The key in Registry::resolving_ of the resolution of schema id `id` (the relay's are by
// subject key, "subject@version", which always has an @).
inline std::string id_resolution_key(uint32_t id) {
    return "#" + std::to_string(id);
}

struct Registry::Resolution {
    std::string key;          // in resolving_
    uint32_t id = 0;          // the schema's
    std::string subject_key;  // the relay's subject version (else a record's schema id)
    std::string body;         // the schema's answer
    ReferenceSet refs;
    std::vector<Transfer*> open;
    std::string failed;  // a transport failure: nothing cached, asked again after the backoff
};

}  // namespace eventbox::registry
