//! Pure logic of the URL shortener.
