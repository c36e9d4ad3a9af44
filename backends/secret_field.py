"""A server's API key in the admin: never shown back, only its last 4 characters."""

from django import forms

from .models import Server


def masked(secret: str) -> str:
    return f"••••{secret[-4:]}" if secret else ""


class ServerForm(forms.ModelForm):
    """`api_key` is write-only: the field starts empty (the stored key is not sent to the
    browser); left empty it keeps the stored key; `clear_api_key` removes it."""

    api_key = forms.CharField(
        required=False,
        max_length=Server._meta.get_field("api_key").max_length,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        label="API key",
    )
    clear_api_key = forms.BooleanField(required=False, label="Remove the stored API key")

    class Meta:
        model = Server
        fields = [f.name for f in Server._meta.concrete_fields if f.editable and not f.primary_key]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        stored = self.instance.api_key if self.instance.pk else ""
        self.fields["api_key"].help_text = (
            f"Stored: {masked(stored)}. Leave empty to keep it; type a new one to replace it."
            if stored
            else "Sent to the server as a Bearer token. Not shown again once saved."
        )

    def clean_api_key(self) -> str:
        typed = self.cleaned_data.get("api_key", "")
        if self.data.get("clear_api_key") in ("on", "true", "1", "True"):
            return ""
        return typed or (self.instance.api_key if self.instance.pk else "")
